"""The plugin's image: what goes in (``contents.toml``) and its builder (``build.py``, also
``python image/build.py``). Not installed; the e2e tier imports the builder."""
