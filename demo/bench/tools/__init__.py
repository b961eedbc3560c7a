"""The workshop: developer tools around the measuring library of demo/bench/, which the app never
imports (tests/test_layout.py): the bench's command line (cli: ``python -m demo.bench``), a step's
profile and the forward's timings (perf, perf_forward, timing: ``python -m demo.perf``), rows of
flags on one engine (sweep), a lookup branch's gain replayed (lookup), an app measured through
/generate (served) and against one hostile client (hostile), and runs compared (compare)."""
