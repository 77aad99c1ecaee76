"""The request path: schedule → session → client/sse → recorder/scrape. It reads
time only through replayer.clock, so a virtual clock can drive it.
See docs/architecture.md."""
