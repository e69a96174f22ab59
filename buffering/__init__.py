"""Mini-batch buffers, aggregations, decorators and runners (built on :mod:`checkpoint` and :mod:`state`)."""
