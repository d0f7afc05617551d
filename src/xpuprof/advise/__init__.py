"""Recommendations: rules over the analyses' results (findings, evidence, a concrete change and
the time it can save)."""
