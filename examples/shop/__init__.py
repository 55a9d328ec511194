"""An order pipeline on plaita: ``plaita dev --flows examples.shop.flows`` runs it (see flows.py)."""
