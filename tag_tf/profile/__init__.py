"""Op-time profiling, the analytical GPU cost model, communication models and the profile database."""
