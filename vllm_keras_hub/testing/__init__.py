"""What the tests share: tiny presets, oracles, engines and servers."""
