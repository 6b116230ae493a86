"""The engine as a service: requests in, event streams out.

One scheduler (``scheduler.EngineService``) owns the model on one worker thread. The window, the CLI,
the speed lab and the HTTP server submit requests — generations, loads, unloads, other work that needs
the model — and each gets a ``RequestHandle``: an id, its own stream of typed events and its own cancel.
Generations on the fast path are decoded together, step by step (``batcher.Batcher``: continuous
batching over a paged KV cache); everything else runs one at a time, in order.
"""
