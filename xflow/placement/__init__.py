"""Device placement: where each part of an optimized graph runs (ColocRL/Placeto/GO line).

Entry point: ``xflow.placement.place.place(graph, cost_model, topology, options) -> PlacementResult``
(options: ``xflow.placement.options.PlaceOptions``; what a user types: ``PlaceSettings``)."""
