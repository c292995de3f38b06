"""An Amazon SQS-compatible HTTP API over msgtable's tables (``msgtable serve --sqs-listen``):
SQS's JSON protocol, as the current AWS SDKs speak it, so that an application in any language
points the SDK it already uses at msgtable. A queue is a table's default group or one of its
subscriptions (msgtable.server.sqs.queues); SendMessage INSERTs through msgtable.enqueue, and
ReceiveMessage takes what the engine's push streams send (msgtable.server.sqs.consumer).

Modules:
    actions    The SQS actions over the engine
    app        The WSGI app of the API and the server that runs it
    consumer   msgtable's push streams as SQS's pull receive
    digest     The MD5 digests of a body and of message attributes, as SQS computes them
    forward    Calls for a table another server sends, forwarded to that server's API
    handles    Receipt handles, each naming one delivery
    manage     CreateQueue, DeleteQueue and PurgeQueue, behind --sqs-manage
    messages   An SQS message as a row of a message table, and back
    protocol   SQS's JSON protocol: parameters, error shapes, msgtable's errors as SQS's
    queues     Which table or subscription a queue is, its URL and its attributes
    sender     SendMessage and SendMessageBatch as INSERTs, one transaction a call
    signature  AWS Signature Version 4, verified
"""
