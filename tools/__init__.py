"""The project's own tooling, which the wheel does not ship: the release checks behind
scripts/release.py and the results tables (tools/release.py). Scripts and tests import it from the
clone's root."""
