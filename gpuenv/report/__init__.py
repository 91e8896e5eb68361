"""Reports rendered from lists of Results: console (rich), JSON, JUnit XML.

HTML and plots for cluster runs live in gpuenv.report.html (controller side).
"""
