"""How many reconciles the operator runs at once, and so how many connections its clients keep.

Most of a reconcile is waiting for the API server or a store, and one whose store hangs holds its
thread until its deadline (handlers/stores.py). kopf runs the synchronous handlers (create,
update, resume, pod events) in ``HANDLER_THREADS`` threads, at most two of them per experiment
(one running, one waiting; more triggers are coalesced): kopf's default, min(32, CPUs + 4), is 6
on a 2-CPU node, where three hung stores would stall every handler. The periodic reconcile runs in
``TICKER_THREADS`` more (handlers/ticker.py). Each client the reconciles share (the Kubernetes
client, an S3 endpoint's client) keeps a connection per thread alive: with fewer, every request
past the pool's size opens a connection and drops it after ("Connection pool is full").
"""

HANDLER_THREADS = 32  # kopf's settings.execution.max_workers (handlers/lifecycle.py)
TICKER_THREADS = 8
RECONCILE_THREADS = HANDLER_THREADS + TICKER_THREADS
