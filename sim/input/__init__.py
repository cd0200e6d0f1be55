"""Reading what a user writes: scenario files, plan files, presets and measured profiles.

Every user-named file goes through ``sim.input.strict`` (one clear line per mistake); ``sim.input.scenario`` turns a scenario YAML into the checked,
frozen ``Scenario`` that every other part of dapplesim reads, one section reader per concept
(``cluster``, ``model``, ``plan_section``, ``fault_section``).
"""
