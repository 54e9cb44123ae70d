"""The web page of `runnerctl serve`: who holds every GPU, and pause/drain/resume.

`routes.install` hangs the page, its JSON API and the session handling on the app
that `runnerctl.controller.app.create_app` builds; `auth` holds accounts, sessions and
CSRF; `view` turns the controller's frozen view into what the page shows.
"""
