"""The run across replicas: the session (`session.py`) over the crossovers' periods and looks
(`periods.py`)."""
