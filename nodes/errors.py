"""Refusals of node requests that the API answers as 403 with a code."""


class NodeScopeRefused(Exception):
    """A node credential tried to act outside its own node (another node's lease, job, probe)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = "outside_node_scope"
        self.message = message


class EnrollmentRefused(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.code = "enrollment_refused"
        self.message = message
