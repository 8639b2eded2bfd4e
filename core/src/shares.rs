//! How the requests a worker's budget (`outbox.max_requests_in_flight`) leaves are shared
//! between the endpoints that want to claim, so that the claim statement only has to weigh
//! bytes.

/// How many deliveries each endpoint may claim, given how many each wants and how many
/// requests the budget leaves: all they want if that fits; otherwise equal shares, with what an
/// endpoint wants less than its share going to the others, and the few left over from the
/// division (or, with more endpoints than requests, the requests themselves) one each to the
/// endpoints counted from `first` on. The caller moves `first` from claim to claim, so no
/// endpoint is passed over for good.
pub fn share_requests(wanted: &[usize], budget: usize, first: usize) -> Vec<usize> {
    if wanted.iter().sum::<usize>() <= budget {
        return wanted.to_vec();
    }
    let mut given = vec![0; wanted.len()];
    // Smallest wants first: those below an equal share of what is left get what they want;
    // from the first that wants more, all the rest get that share.
    let mut by_want: Vec<usize> = (0..wanted.len()).collect();
    by_want.sort_by_key(|&i| wanted[i]);
    let mut left = budget;
    for (place, &i) in by_want.iter().enumerate() {
        let share = left / (wanted.len() - place);
        if wanted[i] > share {
            for &rest in &by_want[place..] {
                given[rest] = share;
            }
            left -= share * (wanted.len() - place);
            break;
        }
        given[i] = wanted[i];
        left -= wanted[i];
    }
    let n = wanted.len();
    for i in (0..n).map(|k| (first + k) % n) {
        if left == 0 {
            break;
        }
        if given[i] < wanted[i] {
            given[i] += 1;
            left -= 1;
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use super::share_requests;

    #[test]
    fn what_fits_is_given_whole() {
        assert_eq!(share_requests(&[100, 50, 3], 256, 0), vec![100, 50, 3]);
    }

    #[test]
    fn equal_shares_and_what_one_does_not_want_goes_to_the_others() {
        assert_eq!(share_requests(&[100, 100, 100], 90, 0), vec![30, 30, 30]);
        assert_eq!(share_requests(&[100, 10, 100], 90, 0), vec![40, 10, 40]);
        assert_eq!(share_requests(&[100, 100], 91, 1), vec![45, 46]);
    }

    #[test]
    fn with_more_endpoints_than_requests_each_turn_serves_the_next_ones() {
        let wanted = vec![100; 5];
        assert_eq!(share_requests(&wanted, 2, 0), vec![1, 1, 0, 0, 0]);
        assert_eq!(share_requests(&wanted, 2, 4), vec![1, 0, 0, 0, 1]);
    }

    #[test]
    fn never_more_than_the_budget_nor_than_an_endpoint_wants() {
        for budget in 0..40 {
            for first in 0..7 {
                let wanted = [0, 1, 5, 9, 17, 3, 100];
                let given = share_requests(&wanted, budget, first);
                assert_eq!(given.iter().sum::<usize>(), budget.min(wanted.iter().sum()));
                assert!(given.iter().zip(wanted).all(|(g, w)| *g <= w));
            }
        }
    }
}
