"""poolctl: the command-line client of Compute Pool for people. It speaks only the public HTTP
API (`/api/v1/`) with a person's API token; it imports nothing of the control plane."""

__version__ = "0.1.0"
