"""What every service with an API shares: bearer-token authentication and
roles (`auth`), the FastAPI dependency that applies them (`security`), the
coded errors every answer uses (`errors`) and the input bounds (`inputs`).

The gateway is the edge; the services that own data (logs, notification,
fault tolerance, the scheduler's pool administration) serve their own routes
with the same rules, so a request routed to them is authorised there again.
"""
