"""The console: its JSON API, the page in a real browser, and every registry kind it lists."""
