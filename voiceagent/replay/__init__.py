"""`voiceagent replay`: reads latency traces, measures each turn's stages, compares runs and reports them
(HTML with waterfall pictures, JSON, Chrome trace-event format, PNG)."""
