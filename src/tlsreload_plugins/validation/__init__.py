"""Where an identity is validated: in a short-lived child process fed through a pipe (:mod:`.apart`), so that a
serving process never loads ``cryptography``; the child itself (:mod:`.child`); starting and reaping it from any
thread, gevent's hub pool included (:mod:`.process`)."""
