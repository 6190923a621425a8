"""Device placement: where each part of an optimized graph runs (ColocRL/Placeto/GO line)."""
