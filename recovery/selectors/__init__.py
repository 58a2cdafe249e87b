"""Reads for the API and the console's pages, each a fixed number of queries whatever the size of what it reads.

One module per screen or resource; import from the module itself (recovery.selectors.queues, ...).
"""
