"""The verifying forward: one forward over new tokens chosen once (forward), exact (row-invariant)
verification and its end-to-end check (exact, exact_setup), token trees' masks and checks, the KV
cache's rollback. Stands on native/ (and the package's root modules); load/ stands on it.
"""
