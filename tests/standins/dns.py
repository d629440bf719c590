"""A cluster DNS stand-in: dnslib over UDP and TCP, answering only from a callable's {name: [IPv4]} records.

Like CoreDNS for a cluster's Services: an A query for a known name returns its addresses (exact name, case
insensitive, trailing dot optional); any other query type for a known name gets NOERROR with no answers (so
glibc's parallel AAAA lookup does not fail the name); every other name gets NXDOMAIN. It never forwards, so a
pod that uses it cannot resolve, or reach by name, anything outside the test. Search paths are the client's job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer

log = logging.getLogger(__name__)

Records = Callable[[], Mapping[str, Sequence[str]]]


class StandInResolver(BaseResolver):
    """Answers from `records()`, called afresh for every query, so changes in the API stand-in show at once."""

    def __init__(self, records: Records, ttl: int = 5):
        if not 0 <= ttl <= 5:
            raise ValueError(f"ttl {ttl} is not allowed; allowed: 0 to 5 seconds (CoreDNS answers Services with 5)")
        self.records = records
        self.ttl = ttl

    def resolve(self, request: DNSRecord, handler) -> DNSRecord:
        reply = request.reply()
        name, qtype = str(request.q.qname).rstrip(".").lower(), request.q.qtype
        try:
            table = {key.rstrip(".").lower(): list(ips) for key, ips in self.records().items()}
        except Exception:  # a broken callable must not leave the client waiting for a reply
            log.exception("DNS records callable failed; answering SERVFAIL")
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if not table.get(name):
            reply.header.rcode = RCODE.NXDOMAIN
        elif qtype in (QTYPE.A, QTYPE.ANY):
            for ip in table[name]:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=self.ttl))
        return reply


class _Logger:
    """dnslib's logger interface, sent to this module's logger at DEBUG (errors at WARNING)."""

    def log_request(self, handler, request):
        log.debug("%s %s/%s %s", handler.client_address[0], handler.protocol, QTYPE[request.q.qtype], request.q.qname)

    def log_reply(self, handler, reply):
        log.debug("-> %s %s", RCODE[reply.header.rcode], [str(rr.rdata) for rr in reply.rr])

    def log_error(self, handler, error):
        log.warning("bad DNS request from %s: %s", handler.client_address[0], error)

    def log_recv(self, *args):
        pass

    log_send = log_truncated = log_data = log_recv


class DnsServer:
    """The resolver served on (host, port) over UDP and TCP from daemon threads; port 0 picks a free port.

    Use as a context manager, or call `start()` and `stop()`.
    """

    def __init__(self, records: Records, host: str = "127.0.0.1", port: int = 0, ttl: int = 5):
        self.resolver = StandInResolver(records, ttl)
        self.host, self.port = host, port
        self._servers: list[DNSServer] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> DnsServer:
        """Binds UDP and TCP on the same port (retrying when another socket holds the TCP side) and serves."""
        for _ in range(20):
            udp = DNSServer(self.resolver, address=self.host, port=self.port, logger=_Logger())
            port = udp.server.server_address[1]
            try:
                tcp = DNSServer(self.resolver, address=self.host, port=port, tcp=True, logger=_Logger())
            except OSError:
                udp.server.server_close()
                if self.port:
                    raise
                continue
            break
        else:
            raise OSError(f"no port on {self.host} was free for both UDP and TCP")
        self.port = port
        for server in (udp, tcp):
            thread = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stops both servers and closes their sockets."""
        for server in self._servers:
            server.server.shutdown()
            server.server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> DnsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def query(name: str, host: str, port: int, qtype: str = "A", tcp: bool = False, timeout: float = 2) -> DNSRecord:
    """Asks (host, port) one question with dnslib and returns the parsed reply."""
    return DNSRecord.parse(DNSRecord.question(name, qtype).send(host, port, tcp=tcp, timeout=timeout))
