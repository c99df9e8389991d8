"""The properties: plain hypothesis tests over every operation of CONTRACT §4 and the compile path (CONTRACT §6). Each module is declared by role in ``declarations/property_modules.py``."""
