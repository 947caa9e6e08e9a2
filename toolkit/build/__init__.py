"""Making programs: the builder (export and AOTInductor compile), the sample programs and the
synthetic programs the tests and benchmarks generate.
"""
