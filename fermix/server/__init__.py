"""The service's front door: the background process behind ``fermix server``."""
