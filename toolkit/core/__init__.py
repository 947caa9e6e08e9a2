"""The pure core: vocabularies, errors, options, the program model, events, the shared-constant
cache, the sharing policies and the verdict.  Imports nothing above it, and no torch, pandas or
numpy, so every decision can be predicted anywhere.
"""
