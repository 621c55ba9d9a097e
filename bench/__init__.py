"""Measurement, one floor above the faces (installed as rstar2_agent.bench): every benchmark, simulator and
calibration, behind `rstar2 bench`. It may import the core and the faces; nothing imports it but the entry point."""
