"""The one generation lifecycle: every reply — the window's, the CLI's, the speed lab's, the server's — is a
``GenerationRequest`` made ready by ``prepare`` (the one prompt builder and context check) and run through a
``Generation`` (its result, seed, clock, stream, end). The fast path's replies run in the ``Batcher``
(continuous batching; a reply alone is a batch of one); the transformers strategies run one at a time
(``solo.run_solo``). The engine service above schedules them; nothing here imports it."""
