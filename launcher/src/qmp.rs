//! A small asynchronous QMP client (QEMU Machine Protocol over a unix socket).
//!
//! QMP is line-delimited JSON: the server greets, the client negotiates with `qmp_capabilities`,
//! then sends commands tagged with an `id` and gets `{"return": ..}` or `{"error": ..}` answers
//! carrying the same `id`, with asynchronous `{"event": ..}` messages interleaved anywhere. One
//! reader task routes answers to their waiting callers by id and broadcasts events to every
//! subscriber, so the lifecycle loop and a hot-plug request can both wait on events.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, broadcast, oneshot};

use super::error::{Error, Result};

/// An asynchronous QMP event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: String,
    pub data: Value,
}

type Pending = Arc<std::sync::Mutex<Option<HashMap<u64, oneshot::Sender<Value>>>>>;

/// A connected, negotiated QMP session. Dropping it closes the socket.
pub struct Qmp {
    writer: Mutex<OwnedWriteHalf>,
    /// Callers waiting for an answer, by id; `None` once the connection is gone.
    pending: Pending,
    next_id: AtomicU64,
    /// Weak so the event stream ends (receivers see `Closed`) when the reader task ends.
    events: broadcast::WeakSender<Event>,
    greeting: Value,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Qmp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Qmp {
    /// Connects to the QMP socket at `path`, reads the greeting and negotiates capabilities.
    /// Returns the session and an event receiver subscribed before any event can arrive.
    pub async fn connect(path: &Path) -> Result<(Qmp, broadcast::Receiver<Event>)> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| Error::io(format!("cannot connect to QMP at {}", path.display()), e))?;
        Self::handshake(stream).await
    }

    async fn handshake(stream: UnixStream) -> Result<(Qmp, broadcast::Receiver<Event>)> {
        let (read, write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let greeting = match lines.next_line().await {
            Ok(Some(line)) => serde_json::from_str::<Value>(&line)
                .ok()
                .filter(|v| v.get("QMP").is_some())
                .ok_or_else(|| Error::QmpProtocol(format!("not a QMP greeting: {line}")))?,
            Ok(None) => return Err(Error::QmpProtocol("closed before the greeting".into())),
            Err(e) => return Err(Error::io("reading the QMP greeting", e)),
        };
        let pending: Pending = Arc::new(std::sync::Mutex::new(Some(HashMap::new())));
        let (events, first_rx) = broadcast::channel(256);
        let reader = tokio::spawn(read_loop(lines, pending.clone(), events.clone()));
        let qmp = Qmp {
            writer: Mutex::new(write),
            pending,
            next_id: AtomicU64::new(1),
            events: events.downgrade(),
            greeting,
            reader,
        };
        qmp.execute("qmp_capabilities", None).await?;
        Ok((qmp, first_rx))
    }

    /// The server's greeting (`{"QMP": {"version": .., "capabilities": ..}}`).
    pub fn greeting(&self) -> &Value {
        &self.greeting
    }

    /// A new receiver of every event from now on.
    /// A new receiver of every event from now on (already closed if the connection is gone).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        match self.events.upgrade() {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Runs `command` with optional `arguments`; returns its `return` value.
    pub async fn execute(&self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().expect("QMP pending map").as_mut() {
            Some(map) => map.insert(id, tx),
            None => return Err(Error::QmpProtocol(format!("{command}: connection closed"))),
        };
        let mut msg = json!({ "execute": command, "id": id });
        if let Some(args) = arguments {
            msg["arguments"] = args;
        }
        let mut line = msg.to_string();
        line.push('\n');
        {
            let mut w = self.writer.lock().await;
            if let Err(e) = w.write_all(line.as_bytes()).await {
                self.forget(id);
                return Err(Error::io(format!("sending QMP command {command}"), e));
            }
        }
        let answer = rx.await.map_err(|_| {
            Error::QmpProtocol(format!("{command}: connection closed before the answer"))
        })?;
        if let Some(ret) = answer.get("return") {
            return Ok(ret.clone());
        }
        let err = answer.get("error").cloned().unwrap_or(Value::Null);
        let text = |k: &str| {
            err.get(k)
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        Err(Error::QmpCommand {
            command: command.to_string(),
            class: text("class"),
            desc: text("desc"),
        })
    }

    fn forget(&self, id: u64) {
        if let Some(map) = self.pending.lock().expect("QMP pending map").as_mut() {
            map.remove(&id);
        }
    }
}

/// Routes every incoming line until the socket closes, then fails all waiting callers (by dropping
/// their senders) and ends the event stream.
async fn read_loop(
    mut lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    pending: Pending,
    events: broadcast::Sender<Event>,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            tracing::warn!(%line, "ignoring a QMP line that is not JSON");
            continue;
        };
        if let Some(name) = msg.get("event").and_then(Value::as_str) {
            let data = msg.get("data").cloned().unwrap_or(Value::Null);
            tracing::debug!(event = name, %data, "QMP event");
            // No subscriber is fine: nobody is interested right now.
            let _ = events.send(Event {
                name: name.to_string(),
                data,
            });
            continue;
        }
        let Some(id) = msg.get("id").and_then(Value::as_u64) else {
            tracing::warn!(%line, "ignoring a QMP answer without a known id");
            continue;
        };
        let waiter = pending
            .lock()
            .expect("QMP pending map")
            .as_mut()
            .and_then(|m| m.remove(&id));
        match waiter {
            Some(tx) => {
                let _ = tx.send(msg);
            }
            None => tracing::warn!(id, "QMP answer nobody waits for"),
        }
    }
    pending.lock().expect("QMP pending map").take();
}

/// A fake QMP server for unit tests of QMP users.
#[cfg(test)]
pub(crate) mod fake {
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::UnixListener;

    pub const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 2, "minor": 0, "major": 10}, "package": ""}, "capabilities": ["oob"]}}"#;

    /// Greets, requires qmp_capabilities first, then answers the script's commands: `script` gets
    /// each parsed command and returns the lines to send back.
    pub async fn server<F>(listener: UnixListener, mut script: F)
    where
        F: FnMut(&Value) -> Vec<String> + Send + 'static,
    {
        let (sock, _) = listener.accept().await.unwrap();
        let (r, mut w) = sock.into_split();
        let mut lines = BufReader::new(r).lines();
        w.write_all(format!("{GREETING}\n").as_bytes())
            .await
            .unwrap();
        let mut negotiated = false;
        while let Ok(Some(line)) = lines.next_line().await {
            let cmd: Value = serde_json::from_str(&line).unwrap();
            let id = cmd["id"].clone();
            let out = if cmd["execute"] == "qmp_capabilities" {
                negotiated = true;
                vec![json!({"return": {}, "id": id}).to_string()]
            } else if !negotiated {
                vec![json!({"error": {"class": "CommandNotFound", "desc": "Expecting capabilities negotiation with 'qmp_capabilities'"}, "id": id}).to_string()]
            } else {
                script(&cmd)
            };
            for l in out {
                w.write_all(format!("{l}\n").as_bytes()).await.unwrap();
            }
        }
    }

    /// A listening socket in a fresh temporary directory.
    pub fn socket() -> (tempfile::TempDir, std::path::PathBuf, UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let l = UnixListener::bind(&path).unwrap();
        (dir, path, l)
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{GREETING, server as fake_server, socket};
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[tokio::test]
    async fn negotiates_and_runs_commands() {
        let (_d, path, l) = socket();
        tokio::spawn(fake_server(l, |cmd| {
            let id = cmd["id"].clone();
            match cmd["execute"].as_str().unwrap() {
                "query-status" => vec![
                    json!({"return": {"status": "prelaunch", "running": false}, "id": id})
                        .to_string(),
                ],
                "device_add" => vec![
                    json!({"error": {"class": "GenericError", "desc": "Duplicate device ID 'disk-x'"}, "id": id}).to_string(),
                ],
                "echo" => vec![json!({"return": cmd["arguments"], "id": id}).to_string()],
                other => panic!("unexpected {other}"),
            }
        }));
        let (qmp, _events) = Qmp::connect(&path).await.unwrap();
        assert_eq!(qmp.greeting()["QMP"]["version"]["qemu"]["major"], 10);
        let st = qmp.execute("query-status", None).await.unwrap();
        assert_eq!(st["status"], "prelaunch");
        let back = qmp
            .execute("echo", Some(json!({"a": [1, "b"]})))
            .await
            .unwrap();
        assert_eq!(back, json!({"a": [1, "b"]}));
        let e = qmp
            .execute("device_add", Some(json!({"id": "disk-x"})))
            .await
            .unwrap_err();
        match &e {
            Error::QmpCommand {
                command,
                class,
                desc,
            } => {
                assert_eq!(command, "device_add");
                assert_eq!(class, "GenericError");
                assert!(desc.contains("Duplicate"));
            }
            other => panic!("wrong error {other:?}"),
        }
    }

    #[tokio::test]
    async fn answers_match_ids_out_of_order_with_events_interleaved() {
        let (_d, path, l) = socket();
        // The server holds the answer to "slow" until "fast" arrives, then answers "fast" first,
        // with events before, between and after the answers.
        let held = std::sync::Arc::new(std::sync::Mutex::new(None::<Value>));
        tokio::spawn(fake_server(l, move |cmd| {
            let id = cmd["id"].clone();
            match cmd["execute"].as_str().unwrap() {
                "slow" => {
                    *held.lock().unwrap() = Some(id);
                    vec![json!({"event": "STOP", "data": {}, "timestamp": {"seconds": 1, "microseconds": 0}}).to_string()]
                }
                "fast" => {
                    let slow_id = held.lock().unwrap().take().unwrap();
                    vec![
                        json!({"event": "RESUME", "timestamp": {"seconds": 2, "microseconds": 0}}).to_string(),
                        json!({"return": "fast-answer", "id": id}).to_string(),
                        json!({"event": "POWERDOWN", "timestamp": {"seconds": 3, "microseconds": 0}}).to_string(),
                        json!({"return": "slow-answer", "id": slow_id}).to_string(),
                        json!({"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}, "timestamp": {"seconds": 4, "microseconds": 0}}).to_string(),
                    ]
                }
                other => panic!("unexpected {other}"),
            }
        }));
        let (qmp, mut events) = Qmp::connect(&path).await.unwrap();
        let mut second = qmp.subscribe();
        let qmp = std::sync::Arc::new(qmp);
        let q = qmp.clone();
        let slow = tokio::spawn(async move { q.execute("slow", None).await });
        // Make sure "slow" is on the wire first.
        assert_eq!(events.recv().await.unwrap().name, "STOP");
        let fast = qmp.execute("fast", None).await.unwrap();
        assert_eq!(fast, "fast-answer");
        assert_eq!(slow.await.unwrap().unwrap(), "slow-answer");
        let mut names = Vec::new();
        for _ in 0..3 {
            names.push(events.recv().await.unwrap());
        }
        assert_eq!(
            names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["RESUME", "POWERDOWN", "SHUTDOWN"]
        );
        assert_eq!(names[2].data["reason"], "guest-shutdown");
        // A second subscriber sees the same stream.
        assert_eq!(second.recv().await.unwrap().name, "STOP");
    }

    #[tokio::test]
    async fn closed_connection_fails_callers_and_ends_events() {
        let (_d, path, l) = socket();
        let server = tokio::spawn(async move {
            let (sock, _) = l.accept().await.unwrap();
            let (r, mut w) = sock.into_split();
            let mut lines = BufReader::new(r).lines();
            w.write_all(format!("{GREETING}\n").as_bytes())
                .await
                .unwrap();
            let cmd: Value =
                serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
            w.write_all(format!("{}\n", json!({"return": {}, "id": cmd["id"]})).as_bytes())
                .await
                .unwrap();
            // Read one more command, then hang up without answering it.
            let _ = lines.next_line().await;
        });
        let (qmp, mut events) = Qmp::connect(&path).await.unwrap();
        let e = qmp.execute("quit", None).await.unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
        server.await.unwrap();
        assert!(matches!(
            events.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        assert!(matches!(
            qmp.subscribe().recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        let e = qmp.execute("query-status", None).await.unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
    }

    #[tokio::test]
    async fn refuses_a_non_qmp_peer() {
        let (_d, path, l) = socket();
        tokio::spawn(async move {
            let (mut sock, _) = l.accept().await.unwrap();
            sock.write_all(b"220 smtp.example ESMTP\n").await.unwrap();
        });
        let e = Qmp::connect(&path).await.err().unwrap();
        assert!(e.to_string().contains("not a QMP greeting"), "{e}");
    }
}
