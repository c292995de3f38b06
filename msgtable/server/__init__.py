"""The server wing: the gRPC servicer (thin: it translates), its authentication, what it takes
off the wire, and the web server the dashboard and /metrics share.

Modules:
    auth       Who may do what
    gil        The server process's GIL: how long a thread that wakes waits for it
    heap       The server process's heap as Python's garbage collector sees it
    listen     Whether this machine can listen on a gRPC server's address
    servicer   The gRPC server
    sqs/       An Amazon SQS-compatible HTTP API over the tables
    webserver  A WSGI app on ``HOST:PORT``
    wire       What the server takes off the wire before its servicer sees a request
"""
