"""``dapple-sim``, the application on top of the simulator: ``check``, ``simulate``,
``calibrate`` and ``schedule``, and what they print and write. Nothing imports it but its
own entry point (the layering test enforces it)."""
