//! The simulation's own semantics: UC drops without a RECV, RC fails with RNR, length errors,
//! CQ overflow, killed queue pairs, delays, and the verbs state machine.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::rdma::verbs::{
    MemoryRegion, PathParams, QpCaps, QpEndpoint, QpType, Region, Verbs, WcOpcode, WcStatus,
};

struct End {
    qp: SimQp,
    mr: SimMr,
    cq: SimCq,
}

const PATH: PathParams = PathParams {
    port: 1,
    mtu: 1024,
    sgid_index: 1,
};

fn endpoint(v: &SimVerbs, ctx: &SimContext, qp: &SimQp, qp_type: QpType) -> QpEndpoint {
    QpEndpoint {
        qpn: v.qp_num(qp),
        psn: 7,
        lid: 0,
        gid: v.query_gid(ctx, 1, 1).expect("gid"),
        qp_type,
    }
}

fn pair(fabric: &Arc<Fabric>, qp_type: QpType, cq_depth: u32) -> (SimVerbs, End, End) {
    let v = fabric.verbs();
    let mut ends = Vec::new();
    let mut eps = Vec::new();
    for dev in ["a", "b"] {
        let ctx = v.open(dev).expect("open");
        let pd = v.alloc_pd(&ctx).expect("pd");
        let cq = v.create_cq(&ctx, cq_depth).expect("cq");
        let caps = QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
        };
        let mut qp = v.create_qp(&pd, &cq, qp_type, caps).expect("qp");
        v.modify_to_init(&mut qp, 1).expect("init");
        let mr = v
            .reg_mr(&pd, Region::new(4096).expect("region"))
            .expect("mr");
        eps.push(endpoint(&v, &ctx, &qp, qp_type));
        ends.push(End { qp, mr, cq });
    }
    for (i, e) in ends.iter_mut().enumerate() {
        v.modify_to_rtr(&mut e.qp, &eps[1 - i], &PATH).expect("rtr");
        v.modify_to_rts(&mut e.qp, 7).expect("rts");
    }
    let b = ends.pop().expect("b");
    let a = ends.pop().expect("a");
    (v, a, b)
}

fn poll(v: &SimVerbs, e: &mut End) -> Vec<crate::rdma::verbs::WorkCompletion> {
    let mut out = Vec::new();
    v.poll_cq(&mut e.cq, &mut out, 64).expect("poll");
    out
}

#[test]
fn send_consumes_the_oldest_recv_and_places_bytes_on_poll() {
    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, mut b) = pair(&fabric, QpType::Uc, 16);
    v.post_recv(&mut b.qp, &b.mr, 0, 100, 1).expect("recv 1");
    v.post_recv(&mut b.qp, &b.mr, 100, 100, 2).expect("recv 2");
    a.mr.region_mut().bytes_mut()[..5].copy_from_slice(b"hello");
    a.mr.region_mut().bytes_mut()[5..8].copy_from_slice(b"abc");
    v.post_send(&mut a.qp, &a.mr, 0, 5, 10).expect("send 1");
    v.post_send(&mut a.qp, &a.mr, 5, 3, 11).expect("send 2");
    let sends = poll(&v, &mut a);
    assert_eq!(sends.len(), 2);
    assert!(
        sends
            .iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send)
    );
    let recvs = poll(&v, &mut b);
    assert_eq!(
        recvs
            .iter()
            .map(|w| (w.wr_id, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, 5), (2, 3)]
    );
    assert_eq!(&b.mr.region().bytes()[..5], b"hello");
    assert_eq!(&b.mr.region().bytes()[100..103], b"abc");
    assert_eq!(fabric.stats().delivered, 2);
}

#[test]
fn uc_drops_a_send_without_recv_silently_and_rc_fails_it() {
    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, mut b) = pair(&fabric, QpType::Uc, 16);
    v.post_send(&mut a.qp, &a.mr, 0, 10, 1).expect("send");
    assert_eq!(poll(&v, &mut a)[0].status, WcStatus::Success);
    assert!(poll(&v, &mut b).is_empty());
    assert_eq!(fabric.stats().dropped_no_recv, 1);

    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, _b) = pair(&fabric, QpType::Rc, 16);
    v.post_send(&mut a.qp, &a.mr, 0, 10, 1).expect("send");
    assert_eq!(poll(&v, &mut a)[0].status, WcStatus::ReceiverNotReady);
    assert_eq!(fabric.qp_state(a.qp.qpn()), Some(SimQpState::Error));
}

#[test]
fn too_long_message_is_a_length_error_and_fails_the_receiver() {
    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, mut b) = pair(&fabric, QpType::Uc, 16);
    v.post_recv(&mut b.qp, &b.mr, 0, 8, 1).expect("recv");
    v.post_recv(&mut b.qp, &b.mr, 8, 8, 2).expect("recv");
    v.post_send(&mut a.qp, &a.mr, 0, 9, 1).expect("send");
    let wcs = poll(&v, &mut b);
    assert_eq!(wcs[0].status, WcStatus::LocalLength);
    assert_eq!(
        wcs[1].status,
        WcStatus::Flushed,
        "the other RECV is flushed"
    );
    assert_eq!(fabric.stats().length_errors, 1);
}

#[test]
fn a_full_cq_overflows_and_reports_it() {
    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, _b) = pair(&fabric, QpType::Uc, 2);
    for i in 0..3 {
        v.post_send(&mut a.qp, &a.mr, 0, 1, i).expect("send");
    }
    let mut out = Vec::new();
    let err = v.poll_cq(&mut a.cq, &mut out, 8).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
    assert_eq!(fabric.qp_state(a.qp.qpn()), Some(SimQpState::Error));
    assert_eq!(fabric.stats().cq_overflows, 1);

    // A capped fabric gives less than asked.
    let fabric = Fabric::new(&["a", "b"]);
    fabric.cap_cq_depth(Some(1));
    let (v, mut a, _b) = pair(&fabric, QpType::Uc, 64);
    v.post_send(&mut a.qp, &a.mr, 0, 1, 1).expect("send");
    v.post_send(&mut a.qp, &a.mr, 0, 1, 2).expect("send");
    assert!(v.poll_cq(&mut a.cq, &mut out, 8).is_err());
}

#[test]
fn killed_qp_flushes_and_later_posts_flush_too() {
    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, mut b) = pair(&fabric, QpType::Uc, 16);
    v.post_recv(&mut b.qp, &b.mr, 0, 8, 1).expect("recv");
    fabric.kill_qp(b.qp.qpn());
    v.post_recv(&mut b.qp, &b.mr, 0, 8, 2)
        .expect("recv after kill");
    let wcs = poll(&v, &mut b);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Flushed), (2, WcStatus::Flushed)]
    );
    // The sender on UC learns nothing.
    v.post_send(&mut a.qp, &a.mr, 0, 4, 9).expect("send");
    assert_eq!(poll(&v, &mut a)[0].status, WcStatus::Success);
    assert_eq!(fabric.stats().dropped_unreachable, 1);
}

#[test]
fn delays_keep_order_and_faults_drop() {
    let fabric = Fabric::new(&["a", "b"]);
    let (v, mut a, mut b) = pair(&fabric, QpType::Uc, 16);
    for i in 0..4 {
        v.post_recv(&mut b.qp, &b.mr, i * 8, 8, i as u64)
            .expect("recv");
    }
    fabric.set_delay(a.qp.qpn(), Duration::from_millis(30));
    for i in 0..3u8 {
        a.mr.region_mut().bytes_mut()[usize::from(i)] = i + 1;
        v.post_send(&mut a.qp, &a.mr, usize::from(i), 1, u64::from(i))
            .expect("send");
    }
    assert!(poll(&v, &mut b).is_empty(), "nothing before the delay");
    std::thread::sleep(Duration::from_millis(40));
    let wcs = poll(&v, &mut b);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(b.mr.region().bytes()[8], 2);
    fabric.set_delay(a.qp.qpn(), Duration::ZERO);
    fabric.drop_next_sends(a.qp.qpn(), 1);
    v.post_send(&mut a.qp, &a.mr, 0, 1, 5).expect("send");
    assert!(poll(&v, &mut b).is_empty());
    assert_eq!(fabric.stats().dropped_by_fault, 1);
}

#[test]
fn state_machine_and_devices_are_checked() {
    let fabric = Fabric::new(&["a"]);
    let v = fabric.verbs();
    let err = v.open("zz").map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("`zz`") && err.contains("\"a\""), "{err}");
    let empty = Fabric::new(&[]);
    let err = empty.verbs().open("a").map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("no RDMA device"), "{err}");
    let ctx = v.open("a").expect("open");
    let pd = v.alloc_pd(&ctx).expect("pd");
    let cq = v.create_cq(&ctx, 4).expect("cq");
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
    };
    let mut qp = v.create_qp(&pd, &cq, QpType::Uc, caps).expect("qp");
    let mr = v.reg_mr(&pd, Region::new(64).expect("region")).expect("mr");
    assert!(
        v.post_recv(&mut qp, &mr, 0, 8, 1).is_err(),
        "RESET takes no RECV"
    );
    assert!(
        v.post_send(&mut qp, &mr, 0, 8, 1).is_err(),
        "RESET sends nothing"
    );
    v.modify_to_init(&mut qp, 1).expect("init");
    v.post_recv(&mut qp, &mr, 0, 8, 1)
        .expect("INIT takes RECVs");
    assert!(
        v.post_recv(&mut qp, &mr, 8, 8, 2).is_err(),
        "max_recv_wr is 1"
    );
    assert!(
        v.post_recv(&mut qp, &mr, 60, 8, 3).is_err(),
        "outside the region"
    );
    fabric.refuse_uc(true);
    assert!(v.create_qp(&pd, &cq, QpType::Uc, caps).is_err());
    assert!(v.create_qp(&pd, &cq, QpType::Rc, caps).is_ok());
}
