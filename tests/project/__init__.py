"""The project as a whole: architecture, packaging, public API, docs, examples, benches, error texts."""
