"""The HTTP layer (FastAPI): the application factory, authentication, request and response
models, the routes, /metrics, the read budget, the connection guard and the dashboard. It
reads the store and sees the collector only through ``api.running``'s Protocols.
"""
