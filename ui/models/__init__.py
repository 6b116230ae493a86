"""The model browser's pages: "Find a model" (search the hub, every variant predicted here, fetch from the row)
and the local library (what is on disk, reclaimable leftovers, Delete), in one dialog (``ModelsDialog``) that the
wizard's model page and Model → Find a model… open. Searching, reading headers, fetching and deleting run on a
thread of their own (``BackgroundWork``), never on the UI thread."""
