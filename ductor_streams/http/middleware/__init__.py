"""What wraps the handlers: CORS, Host checks, request observation, the
tenants' live-read caps, the write budget of catch-up responses, disconnect detection."""
