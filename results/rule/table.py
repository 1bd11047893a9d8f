"""The Markdown table docs/results.md quotes: every point of the rule's evaluations (T = 1 and greedy), as
the Results tab's verifier table holds them. Usage: .venv/bin/python results/rule/table.py"""

from diversed_demo.ui.frontiers import RULE_REPORTS, RULE_REPORTS_GREEDY
from diversed_demo.ui.result_tables import verifier_markdown

print(verifier_markdown({"T = 1": RULE_REPORTS, "greedy": RULE_REPORTS_GREEDY}))
