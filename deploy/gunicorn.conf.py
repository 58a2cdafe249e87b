"""gunicorn's settings for Recovery Console's web processes (docs/deploy.md): `gunicorn -c deploy/gunicorn.conf.py`.

Each value can be overridden from the environment, as the names below say. The web process is meant to sit behind
nginx (deploy/nginx.conf), which buffers request bodies and slow clients: a gunicorn thread is only ever given a
request that has fully arrived, so a few threads serve many clients.
"""

import multiprocessing
import os

wsgi_app = "console.wsgi:application"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")

# Threads, not processes alone: requests wait on PostgreSQL and on long polls (GET /calls/{id}?wait=), and a thread
# waiting costs far less than a process. Two processes per core, four threads each, by default.
# gunicorn's gthread worker, its own refusals under /api/ (a header over the limits below, a Content-Length that is
# not a number...) written as the API's JSON envelope instead of its HTML page (console/gunicorn_worker.py).
worker_class = "console.gunicorn_worker.ApiErrorWorker"
workers = int(os.environ.get("WEB_CONCURRENCY", 2 * multiprocessing.cpu_count()))
threads = int(os.environ.get("GUNICORN_THREADS", 4))

# A request that takes longer than this is killed and its worker restarted: above the API's longest long poll (30 s)
# and the slowest page; the worker finishes its requests for up to graceful_timeout on SIGTERM (a deploy).
timeout = int(os.environ.get("GUNICORN_TIMEOUT", 60))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", 30))
# Longer than nginx keeps an idle upstream connection (keepalive_timeout 60s there): gunicorn must never close a
# connection nginx is about to reuse, which would fail that request with a 502.
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", 75))

# A worker is replaced after this many requests (with jitter, so they do not all restart at once): memory stays
# bounded whatever a long-lived process accumulates.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", 2000))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", 200))

# Behind nginx on the same host (or a private network): trust its X-Forwarded-* headers only from there.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
# What gunicorn reads of a request's head: a request line and each header up to 8190 bytes, 100 headers. The same
# as nginx's (large_client_header_buffers 4 8k): over them either one answers 414 or 431 in the JSON envelope.
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190

accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-")
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")
# Not preloaded: each worker opens its own database connections after the fork.
preload_app = False
