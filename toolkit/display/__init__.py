"""Display helpers every layer above may use: HTML tables, cell text, colours and progress bars.
No torch.
"""
