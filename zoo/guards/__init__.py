"""The guards: one primitive per job between the zoo and a user's files and machine. `files`: every
read of an untrusted file; `writes`: the one lock behind every temporary, the atomic writers, the
sweeps; `budget`: dimensions and memory; `errors`: one-line user errors; `text`: what a file says,
inert wherever it is shown. Nothing outside this package writes, replaces or sweeps a user's file
(tests/test_layout.py holds the rule)."""
