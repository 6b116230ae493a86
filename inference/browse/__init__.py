"""The model browser's engine side, free of Qt: search the hub, list every variant of a repository with what
its estimate needs (``config.json``; a GGUF's header by range reads), predict each on this machine, fetch the
chosen one, and the local library (what is on disk, what can be reclaimed, Delete).

- ``search``: ``HfApi.list_models``, filtered to text-generation models Redline can run;
- ``variants``: a repository's variants (safetensors at each precision Redline loads; GGUF files by quant
  type), read once per commit and cached;
- ``gguf_header``: a GGUF's header and tensor table by HTTP range reads, never the weights;
- ``predict``: memory, fits / tight / does not fit, decode tokens/s and TTFT, "recommended here";
- ``fetch``: the download of one variant (issue 19's progress, resume, cancel and disk check);
- ``library``: local models, reclaimable leftovers, Delete with the space it frees.
"""
