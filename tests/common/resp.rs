//! A minimal RESP2 client over a plain TcpStream, for tests that must see the exact bytes
//! of a reply (error texts, `+QUEUED`) and send arguments no client library would
//! (invalid UTF-8, empty strings). Include with `#[path = "common/resp.rs"] mod resp;`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Arr(Vec<V>),
}

impl V {
    pub fn err_text(&self) -> &str {
        match self {
            V::Err(e) => e,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }
    pub fn int(&self) -> i64 {
        match self {
            V::Int(i) => *i,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }
    pub fn arr(&self) -> &[V] {
        match self {
            V::Arr(v) => v,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }
    pub fn text(&self) -> String {
        match self {
            V::Simple(s) => s.clone(),
            V::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }
}

pub struct Raw {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        // Bounded: a missing reply fails the test instead of hanging it.
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    pub fn encode<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        self.w.write_all(&Self::encode(args)).expect("send");
    }

    pub fn send_bytes(&mut self, b: &[u8]) {
        self.w.write_all(b).expect("send");
    }

    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> V {
        self.send(args);
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = Vec::new();
        self.r.read_until(b'\n', &mut l).expect("read reply");
        assert!(l.ends_with(b"\r\n"), "truncated reply line {l:?}");
        l.truncate(l.len() - 2);
        String::from_utf8(l).expect("utf-8 header")
    }

    pub fn read(&mut self) -> V {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        match t {
            "+" => V::Simple(rest.to_string()),
            "-" => V::Err(rest.to_string()),
            ":" => V::Int(rest.parse().expect("integer")),
            "$" => {
                let n: i64 = rest.parse().expect("bulk length");
                if n < 0 {
                    return V::Nil;
                }
                let mut b = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut b).expect("bulk body");
                b.truncate(n as usize);
                V::Bulk(b)
            }
            "*" => {
                let n: i64 = rest.parse().expect("array length");
                if n < 0 {
                    return V::Nil;
                }
                V::Arr((0..n).map(|_| self.read()).collect())
            }
            other => panic!("unexpected reply type {other:?} in {l:?}"),
        }
    }
}
