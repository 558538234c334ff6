"""Planners: what a deployment's figures will be worth before the data exist.

``comparison``  a group comparison (``zeal.compare``): its standard error, power and minimum
                detectable effect for an assumed fleet
``windows``     a fleet's window averages under a privacy policy: readings per window and
                their standard error, hour by hour of the UTC day
"""
