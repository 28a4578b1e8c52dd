"""Run one peer in this process: router C W | worker W MODE. Stops on SIGTERM."""

import signal
import sys
import threading


def main():
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    if sys.argv[1] == "floor":
        floor(sys.argv[2], sys.argv[3], stop)
    elif sys.argv[1] == "router":
        import logging

        from tandem.broker.router import Router, RouterConfig
        from tandem.common.settings import Addresses

        logging.basicConfig(level=logging.ERROR)
        Router(
            RouterConfig(addresses=Addresses(sys.argv[2], sys.argv[3]), liveness_s=3600.0)
        ).serve(stop)
    else:
        from tandem.bench import null_peers

        null_peers.null_worker(sys.argv[2], sys.argv[3], stop)


def floor(client_addr, worker_addr, stop):
    """The least a Python router does per lone request: decode (strict), a new id,
    encode the Assign, send; decode the worker's batch, encode the client's, send."""
    import zmq

    from tandem.common import protocol as p
    from tandem.common.transport import RouterSocket

    cs, ws = RouterSocket(client_addr), RouterSocket(worker_addr)
    poller = zmq.Poller()
    poller.register(cs.sock, zmq.POLLIN)
    poller.register(ws.sock, zmq.POLLIN)
    worker = None
    n = 0
    by_wid = {}
    while not stop.is_set():
        ready = dict(poller.poll(100))
        if ws.sock in ready:
            while (parts := ws.recv_frames_nowait()) is not None:
                identity, msg = ws.parse(parts)
                msgs = p.entries(msg) if isinstance(msg, p.Batch) else [msg]
                out = {}
                for m in msgs:
                    if isinstance(m, p.Ready):
                        worker = identity
                        ws.send(identity, p.Welcome(policy="floor", epoch="x"))
                        continue
                    rid = getattr(m, "request_id", None)
                    if rid not in by_wid:
                        continue
                    client, crid = by_wid[rid]
                    if isinstance(m, p.TokenDelta):
                        out.setdefault(client, []).extend(
                            [
                                p.Accepted(crid, "null", 3, 0),
                                p.TokenDelta(crid, m.token_ids, m.text),
                            ]
                        )
                    elif isinstance(m, p.Done):
                        del by_wid[rid]
                        out.setdefault(client, []).append(
                            p.Done(crid, m.finish_reason, dict(m.stats))
                        )
                for client, ms in out.items():
                    cs.sock.send(client, zmq.SNDMORE)
                    cs.sock.send(p.encode_batch(ms))
        if cs.sock in ready:
            while (parts := cs.recv_frames_nowait()) is not None:
                identity, msg = cs.parse(parts)
                if isinstance(msg, p.Submit) and worker is not None:
                    n += 1
                    wid = f"e.{n:x}"
                    by_wid[wid] = (identity, msg.request_id)
                    ws.send(worker, p.Assign(wid, list(msg.tokens), msg.sampling, 0))
    cs.close()
    ws.close()


if __name__ == "__main__":
    main()
