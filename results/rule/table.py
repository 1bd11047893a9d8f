"""The Markdown table docs/results.md quotes: every point of the rule's evaluations (T = 1 and greedy), as
the Results tab's verifier table holds them. Usage: .venv/bin/python results/rule/table.py"""

from diversed_demo.ui.frontiers import RULE_REPORTS, RULE_REPORTS_GREEDY
from diversed_demo.ui.result_tables import verifier_table

table = verifier_table({"T = 1": RULE_REPORTS, "greedy": RULE_REPORTS_GREEDY})
print("| " + " | ".join(table.columns) + " |")
print("|" + "---|" * len(table.columns))
for _, row in table.iterrows():
    print("| " + " | ".join(str(value) for value in row) + " |")
