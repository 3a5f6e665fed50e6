"""The guards, one primitive per job between the zoo and a user's files and machine: `files` (reads),
`writes` (the lock, atomic writes, sweeps), `budget` (dimensions, memory), `errors` (one-line user
errors), `text` (inert text). Nothing outside this package writes a user's file (tests/test_layout.py)."""
