"""A hostile-input fuzz of the three command lines (issue 35's acceptance).

``cases.case(seed)`` turns a seed into one command line and the files it reads (scenario YAML
mutated in structure and values, plan JSON, schedule text and torch CSV, calibration CSV,
sweep files, hostile files, ``--set`` and flags); ``runner.run_cases`` executes cases in
process, in a small pool of worker processes with a memory limit and a per-case alarm, and
judges each outcome (``verdict.judge``); ``python -m tests.fuzzing.replay SEED`` replays one.
"""
