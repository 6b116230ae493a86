"""The speed lab's engine: configurations run side by side, the batch sweep, and exports of the results."""
