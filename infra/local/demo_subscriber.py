"""A sample webhook for `make demo`: three endpoints with three behaviours.

  POST /happy   answers 200
  POST /flaky   answers 503 the first time it sees an event id, 200 after
  POST /broken  answers 400 (not retried: the event is dead-lettered)
  POST /notices answers 200 and prints the dead-letter announcements it gets (L7)

Every endpoint answers the endpoint validation handshake as an Event Grid handler does: the
SubscriptionValidationEvent with its validation code, the CloudEvents OPTIONS request by allowing
the origin. Each request is printed as one line. Standard library only.
"""
import http.server
import json
import sys
import threading
import time

seen = set()
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_OPTIONS(self):
        self.send_response(200)
        self.send_header("WebHook-Allowed-Origin", self.headers.get("WebHook-Request-Origin", "*"))
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            events = json.loads(body)
            ids = [e.get("id") for e in events]
        except ValueError:
            events, ids = [], ["<unreadable>"]
        if self.headers.get("aeg-event-type") == "SubscriptionValidation":
            code = events[0]["data"]["validationCode"]
            print(f"{time.strftime('%H:%M:%S')} subscriber {self.path:<7} validation handshake: "
                  f"answering with the code", flush=True)
            answer = json.dumps({"validationResponse": code}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        if self.path == "/notices":
            with lock:
                for e in events:
                    print(f"{time.strftime('%H:%M:%S')} subscriber /notices {e.get('eventType')}: "
                          f"{e.get('data', {}).get('url')} ({e.get('data', {}).get('eventCount')} event)", flush=True)
            self.send_response(200)
            self.end_headers()
            return
        with lock:
            code = self.answer(ids)
        self.send_response(code)
        self.end_headers()

    def answer(self, ids):
        if self.path == "/happy":
            code = 200
        elif self.path == "/flaky":
            code = 200 if all(i in seen for i in ids) else 503
            seen.update(ids)
        else:
            code = 400
        extra = ""
        if self.headers.get("x-demo"):
            secret = "present" if self.headers.get("authorization") else "missing"
            extra = f" (headers: X-Demo={self.headers.get('x-demo')}, Authorization {secret})"
        if self.headers.get("gridrelay-replay"):
            extra += f" replayed by {self.headers.get('gridrelay-replay')}"
        print(
            f"{time.strftime('%H:%M:%S')} subscriber {self.path:<7} "
            f"attempt {int(self.headers.get('aeg-delivery-count', '0')) + 1} "
            f"events {ids} -> {code}{extra}",
            flush=True,
        )
        return code

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
