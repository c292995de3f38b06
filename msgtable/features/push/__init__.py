"""Push to HTTP endpoints: a table's default group or a subscription delivered by POST.

The pieces, one idea each: ``endpoints`` (a definition checked; kept through
msgtable.store.protocol.EndpointStore), ``allow`` (the server's allow-list: which URLs and
addresses it may call), ``body`` (the CloudEvents batch and its Standard Webhooks signature),
``outcome`` (what an answer means for the batch), ``pusher`` (one endpoint's loop: take a
batch, POST, settle), ``pushers`` (the engine's component: one pusher per endpoint while this
server holds the lease).

Modules:
    allow      The push allow-list
    body       What a push POSTs
    endpoints  A push endpoint's definition checked
    outcome    What an endpoint's answer means for the batch it was sent
    pusher     One endpoint's pusher
    pushers    Push endpoints as a component of the engine (msgtable.engine.components)
    transport  One endpoint's HTTP connections
"""
