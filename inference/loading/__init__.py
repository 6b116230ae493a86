"""Loading a model at a precision: transformers and bitsandbytes, and Redline's own packed int8/int4 layers."""
