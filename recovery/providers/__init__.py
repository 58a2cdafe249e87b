"""HTTP adapters to the providers: outbound auth, request templates, explicit timeouts, no retries underneath."""
