"""The drill (issue 25): the product started as a fleet on this machine — its own PostgreSQL and
Redis, two TLS web processes behind one balancer, two Celery workers, one beat and agents in
network namespaces — broken while it works (faults.py), then audited (load.py, audit.py).
`python manage.py drill --json` runs it (run.py)."""
