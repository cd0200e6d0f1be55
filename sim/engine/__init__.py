"""The SimPy engine: the only module that imports simpy (arrives with the engine issue)."""
