"""The memory server's HTTP API (N1): FastAPI routes over one process's ``Memory``."""
